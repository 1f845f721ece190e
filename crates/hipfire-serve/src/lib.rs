//! hipfire-serve: `hipfire serve`, an OpenAI-compatible HTTP server over a continuous-batching
//! engine.
//!
//! # Layout
//! - [`api`] — OpenAI's request/response bodies and the checks that make a [`api::Generation`].
//! - [`http`] — the axum routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//!   `/health`, `/metrics`), the API-key check, SSE streaming.
//! - [`engine`] — the engine thread: sequence slots, the scheduler (join/leave between steps,
//!   chunked prefill beside decode, prefix reuse across requests), sampling, detokenising,
//!   stop strings.
//! - [`metrics`] — Prometheus text exposition.
//! - [`stop`] — stop strings over streamed text.
//! - [`error`] — [`ServeError`] (the server) and [`ApiError`] (one request, OpenAI's shape).
//!
//! # The one design decision
//! tokio lives only at the edge. The model and its KV caches belong to one engine thread that
//! runs a forward step over every active sequence at once ([`hipfire_model::forward_batch`]:
//! each weight read once for the whole batch) and talks to the HTTP tasks by channels. A slow
//! or vanished client therefore never holds the engine, and the engine's long CPU-bound steps
//! never starve the runtime.
#![deny(missing_docs)]

pub mod api;
pub mod engine;
mod error;
mod gpu_slots;
pub mod http;
pub mod metrics;
pub mod stop;

use std::future::IntoFuture;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hipfire_model::Model;

pub use engine::{CpuSlots, EngineConfig, EngineHandle, Feed, PrefillBudget, StepModel};
pub use error::{ApiError, ErrorKind, ServeError};
pub use gpu_slots::GpuSlots;

/// Most sequence slots: far above what a CPU or one GPU batches usefully, and small enough that
/// a typo cannot size an absurd KV reservation.
pub const MAX_PARALLEL: usize = 256;
/// Most queued requests beyond the slots (each costs a tokenised prompt in memory).
pub const MAX_QUEUE: usize = 65_536;
/// tokio worker threads: the edge only parses JSON and copies text, so one thread keeps it
/// off the cores the CPU engine computes on.
pub const HTTP_THREADS: usize = 1;

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to bind (default 127.0.0.1: local only unless asked).
    pub host: IpAddr,
    /// Port (0: any free one; the bound address goes to `on_ready`).
    pub port: u16,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Sequence slots: the largest batch (`--parallel`).
    pub parallel: usize,
    /// Requests that may wait beyond the slots before new ones get 429 (`--queue`).
    pub queue: usize,
    /// Name reported as `model`.
    pub model_name: String,
    /// After SIGTERM/SIGINT, how long in-flight requests may take before they are cut off.
    pub shutdown_grace: Duration,
}

/// KV cache bytes `slots` sequences of `model` can fill at full context, plus each sequence's
/// recurrent state (a hybrid model's DeltaNet layers) and, for a hybrid, the
/// [`engine::MAX_SNAPSHOTS_PER_SLOT`] snapshots a slot keeps for prefix reuse (an
/// attention-only slot reuses a prefix by truncating its cache and keeps none).
pub fn kv_reserve_bytes(model: &Model, slots: usize) -> u64 {
    let c = model.config();
    let recurrent = c.recurrent_bytes_per_sequence() as u64;
    let snapshots = if recurrent > 0 {
        (c.snapshot_bytes() as u64).saturating_mul(engine::MAX_SNAPSHOTS_PER_SLOT as u64)
    } else {
        0
    };
    (hipfire_model::kv_bytes_per_position(model) as u64)
        .saturating_mul(model.ctx_len() as u64)
        .saturating_add(recurrent)
        .saturating_add(snapshots)
        .saturating_mul(slots as u64)
}

/// `MemAvailable` from `/proc/meminfo` (Linux), in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Check the settings and (`kv_in_ram`: the CPU engine's caches) the KV budget before anything
/// starts.
fn check(model: &Model, cfg: &ServeConfig, kv_in_ram: bool) -> Result<(), ServeError> {
    if !(1..=MAX_PARALLEL).contains(&cfg.parallel) {
        return Err(ServeError::Config(format!(
            "--parallel {} must be in 1..={MAX_PARALLEL}",
            cfg.parallel
        )));
    }
    if cfg.queue > MAX_QUEUE {
        return Err(ServeError::Config(format!(
            "--queue {} must be at most {MAX_QUEUE}",
            cfg.queue
        )));
    }
    if cfg.api_key.as_deref() == Some("") {
        return Err(ServeError::Config("--api-key must not be empty".into()));
    }
    let need = kv_reserve_bytes(model, cfg.parallel);
    if let Some(avail) = mem_available().filter(|_| kv_in_ram) {
        if need > avail {
            return Err(ServeError::KvBudget {
                slots: cfg.parallel,
                ctx: model.ctx_len(),
                need_mib: need >> 20,
                avail_mib: avail >> 20,
            });
        }
    }
    Ok(())
}

/// SIGTERM or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serve `model` on the CPU engine until SIGTERM/SIGINT, then finish in-flight requests
/// (for at most `cfg.shutdown_grace`) and return. `on_ready` gets the bound address once the
/// socket listens.
pub fn serve(
    model: Arc<Model>,
    cfg: &ServeConfig,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let parallel = cfg.parallel;
    serve_with(
        model,
        cfg,
        Slots::Cpu,
        move |m| Ok(Box::new(CpuSlots::new(m, parallel))),
        on_ready,
    )
}

/// Where the slots `serve_with` is given keep their KV caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// In RAM (the CPU engine): the full-context reservation is checked against `MemAvailable`.
    Cpu,
    /// In VRAM (the GPU decoder counts them in its own placement budget).
    Gpu,
}

/// As [`serve`] over the slots `make` builds on the engine thread (e.g. [`GpuSlots`] over a
/// `GpuDecoder::with_slots` of `cfg.parallel` slots).
pub fn serve_with<F>(
    model: Arc<Model>,
    cfg: &ServeConfig,
    slots: Slots,
    make: F,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError>
where
    F: for<'m> FnOnce(&'m Model) -> Result<Box<dyn StepModel + 'm>, hipfire_model::ModelError>
        + Send
        + 'static,
{
    check(&model, cfg, slots == Slots::Cpu)?;
    let metrics = Arc::new(metrics::Metrics::default());
    metrics
        .kv_capacity_bytes
        .store(kv_reserve_bytes(&model, cfg.parallel), Ordering::Relaxed);
    let (engine, engine_thread) = engine::spawn(
        model.clone(),
        EngineConfig {
            parallel: cfg.parallel,
            queue: cfg.queue,
        },
        metrics,
        make,
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(HTTP_THREADS)
        .thread_name("hipfire-http")
        .enable_all()
        .build()?;
    let served = rt.block_on(run_http(model, cfg, engine.clone(), on_ready));
    // Past this point no handler holds a handle; the engine ends once this last one is gone.
    engine.abort();
    drop(engine);
    rt.shutdown_timeout(Duration::from_secs(1));
    engine_thread
        .join()
        .map_err(|_| ServeError::Engine("the engine thread panicked".into()))?;
    served
}

async fn run_http(
    model: Arc<Model>,
    cfg: &ServeConfig,
    engine: EngineHandle,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    on_ready(listener.local_addr()?);
    let state = http::AppState {
        engine: engine.clone(),
        model,
        model_name: cfg.model_name.as_str().into(),
        api_key: cfg.api_key.as_deref().map(Arc::from),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let draining = Arc::new(tokio::sync::Notify::new());
    let on_signal = {
        let (engine, draining) = (engine.clone(), draining.clone());
        async move {
            shutdown_signal().await;
            tracing::info!(
                in_flight = engine.in_flight(),
                "shutting down: finishing in-flight requests"
            );
            engine.drain();
            draining.notify_one();
        }
    };
    let server = axum::serve(listener, http::router(state)).with_graceful_shutdown(on_signal);
    let grace = cfg.shutdown_grace;
    tokio::select! {
        r = server.into_future() => r?,
        _ = async { draining.notified().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(
                in_flight = engine.in_flight(),
                grace_s = grace.as_secs_f64(),
                "shutdown deadline passed; cutting off the requests still running"
            );
            engine.abort();
        }
    }
    Ok(())
}
