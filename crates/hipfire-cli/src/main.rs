//! `hipfire`: the command-line program. It parses, dispatches and prints; the work is done by
//! the library crates (hipfire-config, -quant, -gpu, -exec, -model).
//!
//! # Layout
//! - `args` — clap definitions (phase one: only what was typed).
//! - `config_cmd` — `hipfire config ...` over hipfire-config.
//! - `version` — `hipfire version`, including the GPU probe.
//! - `offload_bench` — `hipfire offload-bench`.
//! - `gpu_probe` — the GPU as the CLI sees it: a probe that never crashes.
//! - `model_cmd` — `run`, `synth` over hipfire-model (and the loading `bench` shares).
//! - `bench_cmd` — `bench`: llama-bench-style `pp`/`tg` rows.
//! - `bench_rounds` — `bench --offload-exec A,B,C -r N` on a GPU: interleaved
//!   fresh-process repetitions.
//! - `stats` — the one median every measuring command reports.
//! - `daemon` — the daemon lock (`flock` on the pid file) that keeps measurements off a busy device.
//! - `stop` — SIGINT/SIGTERM as a stop-after-this-token request for `run` and `bench`.
//! - `serve_cmd` — `serve` over hipfire-serve.
//! - `logging` — tracing setup.
//!
//! # Exit status
//! 0 success; 1 refused or nothing to do (a live daemon, nothing to write); 2 error (bad
//! flag or value, I/O, model or device failure); 130 / 143 when `run` or `bench` stopped
//! early on SIGINT / SIGTERM (after printing what it produced). A closed stdout (`hipfire ... | head`) is a
//! quiet success, as in ripgrep.

mod args;
mod bench_cmd;
mod bench_rounds;
mod config_cmd;
mod daemon;
mod gpu_probe;
mod logging;
mod model_cmd;
mod offload_bench;
mod serve_cmd;
mod stats;
mod stop;
mod version;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

/// Success.
pub const EXIT_OK: u8 = 0;
/// Refused or nothing to do.
pub const EXIT_REFUSED: u8 = 1;
/// Error.
pub const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    // clap exits 2 on a usage error and 0 for --help/--version, matching our codes.
    let cli = Cli::parse();
    logging::init(cli.verbose, cli.quiet);
    match run(cli) {
        Ok(code) => code,
        Err(err) if is_broken_pipe(&err) => ExitCode::from(EXIT_OK),
        Err(err) => {
            // {:#} prints the whole context chain on one line: "cannot read x: permission denied".
            let _ = writeln!(std::io::stderr(), "error: {err:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Every mode, one match.
fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let ctx = Ctx {
        config_file: cli.config.clone(),
        quiet: cli.quiet,
    };
    match cli.command {
        Command::Version(a) => version::run(&a),
        Command::Config(a) => config_cmd::run(&ctx, &a.action),
        Command::OffloadBench(a) => offload_bench::run(&ctx, &a),
        Command::Run(a) => model_cmd::run(&ctx, &a),
        Command::Bench(a) => bench_cmd::bench(&ctx, &a),
        Command::Synth(a) => model_cmd::synth(&ctx, &a),
        Command::Serve(a) => serve_cmd::run(&ctx, &a),
    }
}

/// What every command may need from the global flags.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// `--config PATH`, overriding `$HIPFIRE_CONFIG` and the default.
    pub config_file: Option<std::path::PathBuf>,
    /// `--quiet`: no notes on stderr.
    pub quiet: bool,
}

impl Ctx {
    /// A note for the user on stderr (suppressed by `--quiet`); stdout stays machine-readable.
    pub fn note(&self, msg: impl std::fmt::Display) {
        if !self.quiet {
            let _ = writeln!(std::io::stderr(), "{msg}");
        }
    }

    /// Resolve every config key with these flag overrides.
    pub fn settings_with(
        &self,
        cli: &[hipfire_config::CliOverride],
    ) -> anyhow::Result<(hipfire_config::Config, hipfire_config::Settings)> {
        let config = hipfire_config::Config::load(self.config_file.as_deref(), cli)?;
        let settings = config.settings()?;
        // hipfire-gpu's kernel registry reads its cache folder from the environment; hand it
        // the resolved `gpu.kernel_cache` so the file and flags count too. This runs before
        // any worker thread exists (every command resolves settings first), so no thread can
        // be reading the environment while it changes.
        if let hipfire_config::KernelCache::Dir(d) = &settings.kernel_cache {
            std::env::set_var(hipfire_gpu::KERNEL_CACHE_ENV, d);
        }
        Ok((config, settings))
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
