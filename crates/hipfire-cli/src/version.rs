//! `hipfire version`.

use std::io::Write;
use std::process::ExitCode;

use crate::args::VersionArgs;
use crate::{gpu_probe, EXIT_OK};

/// The commit the binary was built from, when the build knew it.
pub fn commit() -> Option<&'static str> {
    option_env!("HIPFIRE_GIT_COMMIT")
}

/// Print version, commit, SIMD tier, whether prompt chunks run on AMX tiles, and GPU probe.
pub fn run(a: &VersionArgs) -> anyhow::Result<ExitCode> {
    let simd = hipfire_quant::simd_tier();
    let amx = hipfire_quant::amx_status();
    let gpu = gpu_probe::probe();
    let mut out = std::io::stdout().lock();
    if a.json {
        let v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "commit": commit(),
            "simd": simd.to_string(),
            "amx": { "used": amx.is_ok(), "why_not": amx.err() },
            "gpu": { "found": gpu.found, "detail": gpu.detail },
            "target": format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(
            out,
            "hipfire {} (commit {})",
            env!("CARGO_PKG_VERSION"),
            commit().unwrap_or("unknown")
        )?;
        writeln!(out, "cpu simd: {simd}")?;
        match amx {
            Ok(()) => writeln!(out, "cpu amx: yes (prompt chunks multiply on bf16 tiles)")?,
            Err(why) => writeln!(out, "cpu amx: no ({why})")?,
        }
        writeln!(out, "gpu: {}", gpu.detail)?;
    }
    Ok(ExitCode::from(EXIT_OK))
}
