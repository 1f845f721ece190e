//! Kernel registry: compiles `kernels/*.cu` for the device's architecture at run time and caches the
//! images on disk, keyed by a SHA-256 of backend, architecture, options, source and headers.
//!
//! Sources are embedded with `include_str!`, so a binary is self-contained (the GPU box has no
//! checkout). Concurrent first users: within a process a per-key mutex makes one thread compile
//! while the others wait; across processes each compiler writes a private temp file and renames it
//! into place (atomic on one filesystem), so readers see either nothing or a whole image.

use crate::context::{Context, Module};
use crate::GpuError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Environment variable naming the on-disk kernel cache folder.
pub const KERNEL_CACHE_ENV: &str = "HIPFIRE_KERNEL_CACHE";

/// One compilable source file and the headers it includes.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// Module name (used in logs and as the compiler's file name).
    pub name: &'static str,
    /// The source text.
    pub source: &'static str,
    /// `(include name, text)` for each header it includes.
    pub headers: &'static [(&'static str, &'static str)],
}

/// `kernels/platform.cuh`: HF_HIP / HF_CUDA, the warp width and -inf (every kernel file but
/// gemv.cu includes it first).
pub const PLATFORM_CUH: &str = include_str!("../../../kernels/platform.cuh");
/// `kernels/blocks.cuh`.
pub const BLOCKS_CUH: &str = include_str!("../../../kernels/blocks.cuh");
/// `kernels/f16.cuh`: f16 bit patterns to and from f32 (the GEMV and the decoder include it).
pub const F16_CUH: &str = include_str!("../../../kernels/f16.cuh");
/// `kernels/gemv.cu`: the GEMV for every format and the activation quantiser.
pub const GEMV_SOURCE: KernelSource = KernelSource {
    name: "gemv.cu",
    source: include_str!("../../../kernels/gemv.cu"),
    headers: &[("blocks.cuh", BLOCKS_CUH), ("f16.cuh", F16_CUH)],
};
/// `kernels/dequant.cu`: weight rows of every GEMV format to row-major f16, and f32 -> f16 (the
/// batched prefill's GEMM operands).
pub const DEQUANT_SOURCE: KernelSource = KernelSource {
    name: "dequant.cu",
    source: include_str!("../../../kernels/dequant.cu"),
    headers: &[
        ("platform.cuh", PLATFORM_CUH),
        ("blocks.cuh", BLOCKS_CUH),
        ("f16.cuh", F16_CUH),
    ],
};
/// `kernels/read.cu`: the read-bandwidth ceiling kernel.
pub const READ_SOURCE: KernelSource = KernelSource {
    name: "read.cu",
    source: include_str!("../../../kernels/read.cu"),
    headers: &[],
};

/// `kernels/flags.cu`: the device half of the `flags` join (mailbox publish and wait-fold).
pub const FLAGS_SOURCE: KernelSource = KernelSource {
    name: "flags.cu",
    source: include_str!("../../../kernels/flags.cu"),
    headers: &[("platform.cuh", PLATFORM_CUH)],
};

type Slot = Arc<Mutex<Option<Arc<Module>>>>;

/// Compiles, caches and loads kernel modules for one context.
#[derive(Debug)]
pub struct KernelRegistry {
    ctx: Arc<Context>,
    /// Where images are cached; `None` when no folder could be determined (compile every run).
    cache_dir: Option<PathBuf>,
    /// One slot per module key; the slot's mutex serialises the first compile of that key.
    modules: Mutex<HashMap<String, Slot>>,
}

impl KernelRegistry {
    /// A registry caching under `$HIPFIRE_KERNEL_CACHE`, else `<cache dir>/hipfire/kernels`.
    pub fn new(ctx: &Arc<Context>) -> KernelRegistry {
        let cache_dir = std::env::var_os(KERNEL_CACHE_ENV)
            .map(PathBuf::from)
            .or_else(|| dirs::cache_dir().map(|d| d.join("hipfire").join("kernels")));
        KernelRegistry {
            ctx: ctx.clone(),
            cache_dir,
            modules: Mutex::new(HashMap::new()),
        }
    }

    /// A registry caching under `dir` (tests).
    pub fn with_cache_dir(ctx: &Arc<Context>, dir: impl Into<PathBuf>) -> KernelRegistry {
        KernelRegistry {
            ctx: ctx.clone(),
            cache_dir: Some(dir.into()),
            modules: Mutex::new(HashMap::new()),
        }
    }

    /// The context modules are loaded into.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The loaded module for `src` compiled with `options`, compiling (once) if needed.
    pub fn module(&self, src: &KernelSource, options: &[String]) -> Result<Arc<Module>, GpuError> {
        let backend = self.ctx.backend();
        let key = cache_key(backend.name(), &backend.info().arch, src, options);
        let slot: Slot = {
            let mut map = self.modules.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key.clone()).or_default().clone()
        };
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = guard.as_ref() {
            return Ok(m.clone());
        }
        let image = self.image(&key, src, options)?;
        let module = self.ctx.load_module(&image)?;
        *guard = Some(module.clone());
        Ok(module)
    }

    fn image(
        &self,
        key: &str,
        src: &KernelSource,
        options: &[String],
    ) -> Result<Vec<u8>, GpuError> {
        let path = self
            .cache_dir
            .as_ref()
            .map(|d| d.join(format!("{key}.bin")));
        if let Some(p) = &path {
            if let Ok(bytes) = std::fs::read(p) {
                tracing::debug!(module = src.name, path = %p.display(), "kernel cache hit");
                return Ok(bytes);
            }
        }
        let t0 = std::time::Instant::now();
        let image = self
            .ctx
            .backend()
            .compile(src.name, src.source, src.headers, options)?;
        tracing::info!(
            module = src.name,
            ms = t0.elapsed().as_millis() as u64,
            "kernel module compiled"
        );
        if let Some(p) = &path {
            if let Err(e) = store_atomic(p, &image) {
                tracing::warn!(cause = %e, "kernel cache not written; compiling again next run");
            }
        }
        Ok(image)
    }
}

/// Hex SHA-256 over everything that changes the image.
fn cache_key(backend: &str, arch: &str, src: &KernelSource, options: &[String]) -> String {
    let mut h = Sha256::new();
    for part in [backend, arch, src.name, src.source] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    for (n, t) in src.headers {
        h.update(n.as_bytes());
        h.update(t.as_bytes());
    }
    for o in options {
        h.update((o.len() as u64).to_le_bytes());
        h.update(o.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` via a private temp file and a rename, so concurrent readers and writers
/// never see a partial image.
pub(crate) fn store_atomic(path: &Path, bytes: &[u8]) -> Result<(), GpuError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let io = |source| GpuError::Cache {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
        std::process::id(),
        nanos
    ));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_every_input() {
        let opts = vec!["-DA=1".to_string()];
        let base = cache_key("cuda", "sm_90", &GEMV_SOURCE, &opts);
        assert_eq!(base.len(), 64);
        assert_ne!(base, cache_key("cuda", "sm_80", &GEMV_SOURCE, &opts));
        assert_ne!(base, cache_key("hip", "sm_90", &GEMV_SOURCE, &opts));
        assert_ne!(base, cache_key("cuda", "sm_90", &READ_SOURCE, &opts));
        assert_ne!(base, cache_key("cuda", "sm_90", &GEMV_SOURCE, &[]));
        assert_eq!(base, cache_key("cuda", "sm_90", &GEMV_SOURCE, &opts));
    }

    #[test]
    fn atomic_store_writes_whole_file_under_concurrency() {
        let dir =
            std::env::temp_dir().join(format!("hipfire-gpu-cache-test-{}", std::process::id()));
        let path = dir.join("k.bin");
        let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 1 << 16]).collect();
        std::thread::scope(|s| {
            for p in &payloads {
                let path = path.clone();
                s.spawn(move || store_atomic(&path, p));
            }
        });
        let got = std::fs::read(&path).expect("cache file written");
        assert!(
            payloads.contains(&got),
            "file is one writer's whole payload"
        );
        let leftovers = std::fs::read_dir(&dir)
            .expect("dir")
            .filter(|e| e.as_ref().map(|e| e.file_name() != "k.bin").unwrap_or(true))
            .count();
        assert_eq!(leftovers, 0, "no temp files left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
