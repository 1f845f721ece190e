//! The GPU as the CLI sees it: a probe that never crashes (no driver library, no device, a
//! driver error all become "no GPU, because ..."), and the engine offload-bench times.

/// Result of looking for a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuStatus {
    /// Whether a usable GPU was found.
    pub found: bool,
    /// Device description, or why none was found.
    pub detail: String,
}

/// Look for GPU 0.
pub fn probe() -> GpuStatus {
    match bench_engine() {
        Ok(g) => GpuStatus {
            found: true,
            detail: g.name(),
        },
        Err(why) => GpuStatus {
            found: false,
            detail: format!("none ({why})"),
        },
    }
}

/// The GPU engine offload-bench measures.
#[derive(Debug)]
pub struct BenchGpu {
    name: String,
}

impl BenchGpu {
    /// Device description.
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// Time the GPU alone over host-mapped `w`, then both engines at the balanced share.
    /// Returns (gpu bytes/s, both bytes/s).
    #[allow(clippy::too_many_arguments)]
    pub fn measure(
        &self,
        _fmt: hipfire_quant::Format,
        _w: &[u8],
        _k: usize,
        _m: usize,
        _reps: usize,
        _r_cpu: f64,
        _threads: usize,
    ) -> anyhow::Result<(f64, f64)> {
        anyhow::bail!("GPU timing is not wired in this build")
    }
}

/// Open GPU 0 for benchmarking, or say why not.
pub fn bench_engine() -> Result<BenchGpu, String> {
    Err("hipfire-gpu exposes no device API in this build".to_string())
}
