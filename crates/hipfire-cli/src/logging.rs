//! tracing setup: stderr, EnvFilter from RUST_LOG (else from -v / --quiet), and
//! `HIPFIRE_CPU_EXEC_TRACE=1` turning on the per-step split trace.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Target of the per-step split trace lines (share, rows, arm timings, refusals).
pub const CPU_EXEC_TARGET: &str = "hipfire::cpu_exec";
/// Env var that enables [`CPU_EXEC_TARGET`] at debug level.
pub const CPU_EXEC_TRACE_ENV: &str = "HIPFIRE_CPU_EXEC_TRACE";

/// The filter used when RUST_LOG is unset.
fn default_level(verbose: u8, quiet: bool) -> &'static str {
    match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    }
}

/// Build the filter: RUST_LOG if set and valid, else the -v level; plus the split trace.
pub fn filter(verbose: u8, quiet: bool, rust_log: Option<&str>, trace: bool) -> EnvFilter {
    let base = rust_log
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new(default_level(verbose, quiet)));
    if trace {
        match format!("{CPU_EXEC_TARGET}=debug").parse() {
            Ok(d) => base.add_directive(d),
            Err(_) => base,
        }
    } else {
        base
    }
}

/// Install the global subscriber (once; a second call is ignored).
pub fn init(verbose: u8, quiet: bool) {
    let rust_log = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let trace = std::env::var(CPU_EXEC_TRACE_ENV).is_ok_and(|v| v == "1");
    let f = filter(verbose, quiet, rust_log.as_deref(), trace);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(f)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: traces are often redirected to a file and grepped.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(verbose > 0 || trace)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_flag_adds_the_cpu_exec_directive() {
        let f = filter(0, false, None, true).to_string();
        assert!(f.contains("hipfire::cpu_exec=debug"), "{f}");
        let f = filter(0, false, None, false).to_string();
        assert!(!f.contains("cpu_exec"), "{f}");
    }

    #[test]
    fn rust_log_wins_over_verbosity() {
        assert_eq!(
            filter(3, false, Some("hipfire_exec=info"), false).to_string(),
            "hipfire_exec=info"
        );
        assert_eq!(filter(0, true, None, false).to_string(), "error");
        assert_eq!(filter(2, false, None, false).to_string(), "debug");
    }
}
