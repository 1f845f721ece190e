//! The GPU as the CLI sees it: a probe that never crashes (no driver library, no device, a
//! driver error all become "no GPU, because ..."), and the engine offload-bench times.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use hipfire_gpu::{
    Activation, Context, DeviceBuffer, GemvForm, GemvKernels, HostMappedBuffer, KernelRegistry,
    RowRange, Stream, WeightRef,
};
use hipfire_quant::Format;

/// Result of looking for a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuStatus {
    /// Whether a usable GPU was found.
    pub found: bool,
    /// Device description, or why none was found.
    pub detail: String,
}

/// Open GPU 0, turning every failure — including a panic inside a driver binding — into the
/// reason there is no GPU. The panic hook is silenced for the call so a missing libcuda is a
/// one-line "none (...)" and not a backtrace.
fn open() -> Result<Arc<Context>, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| Context::new(0));
    std::panic::set_hook(hook);
    match r {
        Ok(Ok(ctx)) => Ok(ctx),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the GPU driver binding panicked while loading".to_string()),
    }
}

fn describe(ctx: &Context) -> String {
    let i = ctx.info();
    format!(
        "{} ({}, {} SMs, {:.0} GiB, {})",
        i.name,
        i.arch,
        i.multiprocessors,
        i.total_mem as f64 / f64::from(1u32 << 30),
        ctx.backend().name()
    )
}

/// Look for GPU 0.
pub fn probe() -> GpuStatus {
    match open() {
        Ok(ctx) => GpuStatus {
            found: true,
            detail: describe(&ctx),
        },
        Err(why) => GpuStatus {
            found: false,
            detail: format!("none ({why})"),
        },
    }
}

/// The GPU engine offload-bench measures: context, stream and the GEMV kernels.
#[derive(Debug)]
pub struct BenchGpu {
    ctx: Arc<Context>,
    kernels: GemvKernels,
    stream: Stream,
}

/// Whether offload-bench has a GPU to measure.
#[derive(Debug)]
pub enum GpuAvail {
    /// A GPU with its kernels loaded.
    Found(Box<BenchGpu>),
    /// No GPU, and why (printed as a note; the CPU is still measured).
    Absent(String),
}

/// Open GPU 0 for benchmarking. No device is [`GpuAvail::Absent`]; a device whose kernels
/// cannot be built is an error (measuring only the CPU then would hide a broken install).
pub fn bench_engine(
    device: hipfire_config::Device,
    kernel_cache: Option<PathBuf>,
) -> anyhow::Result<GpuAvail> {
    if device == hipfire_config::Device::Cpu {
        return Ok(GpuAvail::Absent("device = cpu".to_string()));
    }
    let ctx = match open() {
        Ok(c) => c,
        Err(why) if device == hipfire_config::Device::Gpu => {
            anyhow::bail!("device = gpu, but no GPU could be opened: {why}")
        }
        Err(why) => return Ok(GpuAvail::Absent(why)),
    };
    let registry = match kernel_cache {
        Some(dir) => KernelRegistry::with_cache_dir(&ctx, dir),
        None => KernelRegistry::new(&ctx),
    };
    let kernels = GemvKernels::new(&registry)
        .with_context(|| format!("loading the GEMV kernels on {}", describe(&ctx)))?;
    let stream = ctx.new_stream()?;
    Ok(GpuAvail::Found(Box::new(BenchGpu {
        ctx,
        kernels,
        stream,
    })))
}

/// One format's matrix in pinned host-mapped memory plus the GPU-side activation and output.
pub struct Staged {
    hm: HostMappedBuffer,
    act: Activation,
    y: DeviceBuffer<f32>,
    fmt: Format,
    m: usize,
    k: usize,
}

impl Staged {
    /// The weight bytes as the CPU sees them (the same pinned pages the GPU reads).
    pub fn host(&self) -> &[u8] {
        self.hm.as_slice()
    }
}

impl BenchGpu {
    /// Device description.
    pub fn name(&self) -> String {
        describe(&self.ctx)
    }

    /// Copy `w` (m rows of `fmt` at `k`) into pinned host-mapped memory and prepare `x` on the GPU.
    pub fn stage(
        &self,
        fmt: Format,
        w: &[u8],
        x: &[f32],
        m: usize,
        k: usize,
    ) -> anyhow::Result<Staged> {
        let mut hm = self.ctx.alloc_host_mapped(w.len())?;
        hm.as_mut_slice().copy_from_slice(w);
        let mut xd = self.ctx.alloc::<f32>(k)?;
        xd.upload(&self.stream, x)?;
        let mut act = Activation::new(&self.ctx, k)?;
        self.kernels.prepare(&self.stream, &xd, &mut act)?;
        let y = self.ctx.alloc::<f32>(m)?;
        self.stream.synchronize()?;
        Ok(Staged {
            hm,
            act,
            y,
            fmt,
            m,
            k,
        })
    }

    /// Queue the GEMV of `rows` over the host-mapped weight (returns before it runs).
    pub fn launch(&self, s: &mut Staged, rows: RowRange) -> anyhow::Result<()> {
        let w = WeightRef::new(&s.hm, 0, s.fmt, s.m, s.k)?;
        self.kernels
            .gemv(&self.stream, &w, &s.act, &mut s.y, rows, GemvForm::Plain)?;
        Ok(())
    }

    /// Wait for everything queued.
    pub fn sync(&self) -> anyhow::Result<()> {
        self.stream.synchronize()?;
        Ok(())
    }

    /// Seconds the GPU takes for `rows`, timed with events around the launch (the GPU's own
    /// clock, not a host poll).
    pub fn time_rows(&self, s: &mut Staged, rows: RowRange) -> anyhow::Result<f64> {
        let start = self.ctx.new_event()?;
        let end = self.ctx.new_event()?;
        start.record(&self.stream)?;
        self.launch(s, rows)?;
        end.record(&self.stream)?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?) / 1e3)
    }
}
