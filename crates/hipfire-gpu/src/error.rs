//! The crate's error type.
//!
//! One enum for every backend so callers (the executor's GPU actor) match on causes, not on
//! backend-specific codes: a driver failure names the call that failed and carries the driver's own
//! name and text for the code, like cudarc's `DriverError`.

use hipfire_quant::{Format, QuantError};
use thiserror::Error;

/// A failing driver/runtime call's code, with the driver's name and description of it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{backend} error {code} ({name}): {message}")]
pub struct DriverCode {
    /// Which backend produced it ("cuda", "hip", "nvrtc", "hiprtc").
    pub backend: &'static str,
    /// The raw status code.
    pub code: i64,
    /// The driver's symbolic name (e.g. `CUDA_ERROR_OUT_OF_MEMORY`).
    pub name: String,
    /// The driver's description.
    pub message: String,
}

/// Everything that can go wrong in hipfire-gpu.
#[derive(Debug, Error)]
pub enum GpuError {
    /// No usable GPU: the driver library is missing, failed to initialise, or reports no devices.
    #[error("no GPU: {reason}")]
    NoGpu {
        /// Why.
        reason: String,
    },
    /// The requested backend was not compiled in (cargo feature off).
    #[error(
        "GPU backend `{backend}` is not built into this binary (enable cargo feature `{backend}`)"
    )]
    BackendNotBuilt {
        /// The backend's name.
        backend: &'static str,
    },
    /// A driver call failed.
    #[error("{call} failed: {source}")]
    Driver {
        /// The driver entry point that failed.
        call: &'static str,
        /// The driver's code.
        source: DriverCode,
    },
    /// Run-time compilation of a kernel module failed.
    #[error("compiling kernel module `{module}` for {arch} failed:\n{log}")]
    Compile {
        /// Module name.
        module: String,
        /// Target architecture.
        arch: String,
        /// Compiler log.
        log: String,
    },
    /// Device memory (VRAM) could not be allocated.
    #[error(
        "cannot allocate {requested} bytes of device memory ({}): {driver}",
        free_text(*.free, *.total)
    )]
    DeviceAlloc {
        /// Bytes requested.
        requested: usize,
        /// Free device bytes at the time of the failure (`cuMemGetInfo`), if the query worked.
        free: Option<u64>,
        /// Total device bytes, if the query worked.
        total: Option<u64>,
        /// The driver's answer (in the message, so not repeated as a source).
        driver: DriverCode,
    },
    /// Pinned (page-locked) host memory could not be allocated.
    #[error(
        "cannot pin {requested} bytes of host memory (MemAvailable: {}): {source}",
        .mem_available.map(|b| format!("{b} bytes")).unwrap_or_else(|| "unknown".into())
    )]
    HostAlloc {
        /// Bytes requested.
        requested: usize,
        /// `MemAvailable` from /proc/meminfo at the time of the failure, if readable.
        mem_available: Option<u64>,
        /// The driver's answer.
        source: DriverCode,
    },
    /// A row range outside `[0, m)` or empty.
    #[error("row range [{start}, {end}) is not a non-empty range within [0, {m})")]
    BadRowRange {
        /// Range start.
        start: usize,
        /// Range end (exclusive).
        end: usize,
        /// Rows in the matrix.
        m: usize,
    },
    /// A buffer is smaller than the launch needs.
    #[error("{what}: {got} bytes, {need} needed")]
    BufferTooSmall {
        /// Which buffer.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// A pointer or stride does not have the alignment the kernel needs.
    #[error("{what} is not {align}-byte aligned")]
    Misaligned {
        /// What is misaligned.
        what: &'static str,
        /// Required alignment in bytes.
        align: usize,
    },
    /// A shape the GPU kernels do not cover.
    #[error("unsupported shape for {format}: {why}")]
    Unsupported {
        /// Format.
        format: Format,
        /// Why.
        why: String,
    },
    /// Activation prepared for a different `k` than the weight's.
    #[error("activation prepared for k = {got}, weight has k = {need}")]
    ActivationMismatch {
        /// Weight k.
        need: usize,
        /// Activation k.
        got: usize,
    },
    /// An argument breaks a rule the launch states.
    #[error("{what}: {rule}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// Objects from two different contexts were mixed in one call.
    #[error("{what} belongs to another GPU context")]
    WrongContext {
        /// Which object.
        what: &'static str,
    },
    /// The dense GEMM of batched steps has no library here (cuBLAS absent, or a backend without
    /// a binding); callers fall back to per-token GEMVs.
    #[error("no GEMM library on {backend}: {why}")]
    NoBlas {
        /// The backend's name.
        backend: &'static str,
        /// Why (which library was looked for).
        why: String,
    },
    /// Stream capture and graph replay are not bound on this backend; callers launch each
    /// kernel instead.
    #[error("no graph support on {backend}")]
    NoGraphs {
        /// The backend's name.
        backend: &'static str,
    },
    /// A format/shape error from hipfire-quant.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// Kernel cache I/O failed.
    #[error("kernel cache {path}: {source}")]
    Cache {
        /// The file or folder.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// "N bytes free of T", or "free memory unknown" when the query failed too.
fn free_text(free: Option<u64>, total: Option<u64>) -> String {
    match (free, total) {
        (Some(f), Some(t)) => format!("{f} bytes free of {t}"),
        (Some(f), None) => format!("{f} bytes free"),
        _ => "free memory unknown".into(),
    }
}

/// Environment variable of a test hook: when set to a byte count, every device allocation
/// larger than it fails with [`GpuError::DeviceAlloc`] as if VRAM were exhausted, so the GPU
/// tier can check that a failed load allocation is a clean, named error (the real failure
/// needs more VRAM than a test can cheaply fill). Unset in normal use.
pub const TEST_MAX_ALLOC_ENV: &str = "HIPFIRE_GPU_TEST_MAX_ALLOC_BYTES";

/// The [`TEST_MAX_ALLOC_ENV`] limit, read once per process.
pub(crate) fn test_max_alloc() -> Option<u64> {
    static LIMIT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| std::env::var(TEST_MAX_ALLOC_ENV).ok()?.trim().parse().ok())
}

/// The error the [`TEST_MAX_ALLOC_ENV`] hook reports, shaped like the driver's own.
pub(crate) fn test_alloc_refusal(
    requested: usize,
    free: Option<u64>,
    total: Option<u64>,
) -> GpuError {
    GpuError::DeviceAlloc {
        requested,
        free,
        total,
        driver: DriverCode {
            backend: "test hook",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            message: format!("{TEST_MAX_ALLOC_ENV} refuses allocations this large"),
        },
    }
}

/// Bytes of `MemAvailable` in /proc/meminfo, if it can be read (Linux only).
pub fn mem_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

/// Parses the `MemAvailable:  N kB` line of a /proc/meminfo text.
pub(crate) fn parse_mem_available(text: &str) -> Option<u64> {
    /// /proc/meminfo reports kibibytes.
    const KIB: u64 = 1024;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * KIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_alloc_names_bytes_asked_and_free() {
        let e = test_alloc_refusal(3 << 30, Some(1 << 30), Some(80 << 30)).to_string();
        assert!(
            e.contains(&(3u64 << 30).to_string())
                && e.contains(&format!("{} bytes free of {}", 1u64 << 30, 80u64 << 30)),
            "{e}"
        );
        let e = test_alloc_refusal(5, None, None).to_string();
        assert!(
            e.contains("5 bytes") && e.contains("free memory unknown"),
            "{e}"
        );
    }
}
