//! `hipfire serve`: load the model on the CPU, then hand it to hipfire-serve until a signal.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hipfire_model::gpu::GpuDecoder;
use hipfire_serve::{GpuSlots, ServeConfig, Slots};

use crate::args::ServeArgs;
use crate::model_cmd::Engine;
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

    let engine = crate::model_cmd::choose_engine(ctx, &s)?;
    // Refuse a mode the executor cannot run before spending time on the load.
    let mode = match engine {
        Engine::Gpu => Some(crate::model_cmd::offload_mode(&s)?),
        Engine::Cpu => None,
    };
    let loaded = crate::model_cmd::load(ctx, engine, &a.model, &s, s.ctx_size.tokens(), false)?;
    let (model, gpu_pool) = (loaded.model, loaded.gpu_pool);
    if mode.is_none() {
        ctx.note(format!("serve: {}", model.placement_summary()));
    }
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
    let on_ready = |addr| {
        // One line on stdout (scripts and tests read the port from it), notes on stderr.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
        ctx.note(format!(
            "serve: {parallel} slots, queue {queue}; SIGTERM or Ctrl-C stops after in-flight requests"
        ));
    };
    let model = Arc::new(model);
    match mode {
        None => hipfire_serve::serve(model, &cfg, on_ready)?,
        Some(mode) => {
            let opts = crate::model_cmd::gpu_options(&s, mode);
            let pool = match gpu_pool {
                Some(pool) => pool,
                None => {
                    hipfire_exec::offload::offload_pool(crate::model_cmd::pool_threads(s.threads))?
                }
            };
            // Built on the engine thread, which then drives its stream; the placement line goes
            // to the log there.
            hipfire_serve::serve_with(
                model,
                &cfg,
                Slots::Gpu,
                move |m| {
                    let dec = GpuDecoder::with_slots(m, pool, &opts, parallel)?;
                    tracing::info!(placement = dec.placement_summary(), "serve: model placed");
                    eprintln!("serve: {}", dec.placement_summary());
                    Ok(Box::new(GpuSlots::new(dec)))
                },
                on_ready,
            )?
        }
    }
    ctx.note("serve: stopped");
    Ok(ExitCode::from(EXIT_OK))
}
