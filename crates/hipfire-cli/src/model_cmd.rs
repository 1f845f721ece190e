//! `run`, `synth` and the loading `bench` shares: thin wrappers over hipfire-model (phase two
//! of argument handling: resolved settings → a device, a loaded model, a decoder).

use std::hash::{BuildHasher, Hasher};
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use hipfire_config::{Device, JoinStrategy, OffloadExec, PassbackShare, Settings, Source};
use hipfire_exec::offload::{JoinStrategy as ExecJoin, OffloadMode};
use hipfire_exec::share::ShareSetting;
use hipfire_model::gpu::{GpuDecoder, GpuOptions, HostExperts};
use hipfire_model::{write_synthetic_to, Overwrite, RopeScaling, RopeScalingKind, SynthSpec};
use hipfire_model::{
    ChatMessage, GenerationStats, LoadOptions, LoadProgress, Model, ProgressFn, SamplingParams,
    StreamDecoder,
};

use crate::args::{RunArgs, SynthArgs, SynthRopeScaling};
use crate::stop::{self, Stop};
use crate::{gpu_probe, Ctx, EXIT_OK};

/// The executor's spelling of the configured offload mode.
pub(crate) fn offload_mode(s: &Settings) -> anyhow::Result<OffloadMode> {
    Ok(match s.offload_exec {
        OffloadExec::Pcie => OffloadMode::Pcie,
        OffloadExec::Cpu => OffloadMode::Cpu,
        OffloadExec::Passback => OffloadMode::Passback {
            share: match s.passback_share {
                PassbackShare::Auto => ShareSetting::Auto,
                PassbackShare::CpuOnly => ShareSetting::Off,
                PassbackShare::Pinned(x) => ShareSetting::Pinned(x),
            },
            strategy: match s.join_strategy {
                JoinStrategy::Ordering => ExecJoin::Ordering,
                JoinStrategy::TwoStream => ExecJoin::TwoStream,
                JoinStrategy::Flags => ExecJoin::Flags,
            },
        },
    })
}

/// Where the model runs.
pub(crate) enum Engine {
    /// Every matrix product on the CPU pool.
    Cpu,
    /// On GPU 0 with spilled layers run by the configured mode.
    Gpu,
}

/// `device` → engine: `auto` probes (and says when it falls back), `gpu` requires one.
pub(crate) fn choose_engine(ctx: &Ctx, s: &Settings) -> anyhow::Result<Engine> {
    match s.device {
        Device::Cpu => Ok(Engine::Cpu),
        Device::Gpu => {
            let p = gpu_probe::probe();
            if !p.found {
                bail!("device = gpu, but no GPU could be opened: {}", p.detail);
            }
            Ok(Engine::Gpu)
        }
        Device::Auto => {
            let p = gpu_probe::probe();
            if p.found {
                Ok(Engine::Gpu)
            } else {
                ctx.note(format!("gpu: {}; running on the CPU", p.detail));
                Ok(Engine::Cpu)
            }
        }
    }
}

/// A seed from the OS (std's hash keys are drawn from OS randomness per `RandomState`).
fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
}

fn sampling(s: &Settings) -> (SamplingParams, u64) {
    let seed = s.sampling.seed.unwrap_or_else(random_seed);
    let p = SamplingParams {
        temperature: s.sampling.temperature,
        top_k: s.sampling.top_k as usize,
        top_p: s.sampling.top_p,
        seed,
        max_tokens: s.sampling.max_tokens as usize,
        stop_at_eog: true,
    };
    (p, seed)
}

/// A load progress bar on an interactive stderr; nothing otherwise.
fn progress(ctx: &Ctx, enabled: bool) -> Option<ProgressFn> {
    if ctx.quiet || !enabled || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(Arc::new(move |p: &LoadProgress| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.done_bytes);
        if p.done_bytes >= p.total_bytes {
            bar.finish_and_clear();
        }
    }))
}

/// The model plus whichever decoder runs it.
pub(crate) struct Loaded {
    pub(crate) model: Model,
    pub(crate) engine: Engine,
    /// The GPU engine's CPU workers (its offload pool), also the model's CPU backend: one set of
    /// pinned workers serves both. `None` on the CPU engine.
    pub(crate) gpu_pool: Option<hipfire_exec::CpuPool>,
}

pub(crate) fn load(
    ctx: &Ctx,
    engine: Engine,
    path: &std::path::Path,
    s: &Settings,
    ctx_len: Option<usize>,
    bar: bool,
) -> anyhow::Result<Loaded> {
    let threads = s.threads.get().get();
    let opts = LoadOptions {
        threads,
        ctx_len,
        progress: progress(ctx, bar),
        cache_type: match s.cache_type {
            hipfire_config::CacheType::F16 => hipfire_model::attention::CacheType::F16,
            hipfire_config::CacheType::Q8_0 => hipfire_model::attention::CacheType::Q8_0,
        },
    };
    let file = hipfire_model::gguf::GgufFile::open(path)
        .with_context(|| format!("loading {}", path.display()))?;
    // On the GPU engine the offload pool is also the model's backend, so there is one set of
    // pinned workers; `auto` is 0 there so the pool leaves one core to the thread driving the
    // GPU.
    let gpu_pool = match engine {
        Engine::Cpu => None,
        Engine::Gpu => Some(hipfire_exec::offload::offload_pool(pool_threads(
            s.threads,
        ))?),
    };
    let backend = match &gpu_pool {
        None => {
            Arc::new(hipfire_model::CpuBackend::new(threads)?) as Arc<dyn hipfire_model::Backend>
        }
        Some(pool) => Arc::new(hipfire_model::CpuBackend::with_pool(pool.clone())) as Arc<_>,
    };
    let model = Model::from_gguf(file, &opts, backend)
        .with_context(|| format!("loading {}", path.display()))?;
    // `--cpu-moe` / `--n-cpu-moe` must fit the model whichever engine runs it (a dense model
    // has no experts to hold; a layer count past the model's is a typo).
    let host = host_experts(s);
    let c = model.config();
    host.host_layers(c.n_layer, c.moe.is_some())
        .with_context(|| format!("loading {}", path.display()))?;
    // The GPU engine refuses what only the CPU runs (a hybrid model's routed experts, gpt-oss's
    // sinks and biased experts: `ModelConfig::cpu_only_layers`); `auto` runs such a model on the CPU instead.
    let engine = match engine {
        Engine::Gpu if s.device == Device::Auto => {
            match hipfire_model::gpu::refusal(model.config()) {
                Some(why) => {
                    ctx.note(format!(
                        "gpu: {why} ({}); running on the CPU",
                        model.config().arch.name()
                    ));
                    Engine::Cpu
                }
                None => Engine::Gpu,
            }
        }
        e => e,
    };
    if matches!(engine, Engine::Cpu) && host != HostExperts::None {
        ctx.note(
            "note: memory.n_cpu_moe (--cpu-moe / --n-cpu-moe) is inert on the CPU engine: its \
             experts are in RAM already",
        );
    }
    // The CPU session's cache grows as positions fill; refuse up front a context whose full
    // cache would not fit in RAM. (On the GPU the cache is in VRAM: GpuDecoder counts it.)
    if matches!(engine, Engine::Cpu) {
        if let Some(avail) = hipfire_gpu::mem_available_bytes() {
            model
                .check_kv_fits_ram(avail, s.ram_margin_mib << 20)
                .with_context(|| format!("loading {}", path.display()))?;
        }
    }
    Ok(Loaded {
        model,
        engine,
        gpu_pool,
    })
}

pub(crate) fn gpu_decoder<'m>(
    l: &'m Loaded,
    s: &Settings,
    mode: OffloadMode,
) -> anyhow::Result<GpuDecoder<'m>> {
    gpu_decoder_slots(l, s, mode, 1)
}

/// As [`gpu_decoder`] with `slots` sequence slots (batched decode).
pub(crate) fn gpu_decoder_slots<'m>(
    l: &'m Loaded,
    s: &Settings,
    mode: OffloadMode,
    slots: usize,
) -> anyhow::Result<GpuDecoder<'m>> {
    let opts = gpu_options(s, mode);
    let pool = match &l.gpu_pool {
        Some(pool) => pool.clone(),
        None => hipfire_exec::offload::offload_pool(pool_threads(s.threads))?,
    };
    GpuDecoder::with_slots(&l.model, pool, &opts, slots).context("placing the model on GPU 0")
}

/// The GPU decoder's options from the settings, with spilled projections run as `mode`.
pub(crate) fn gpu_options(s: &Settings, mode: OffloadMode) -> GpuOptions {
    GpuOptions {
        ordinal: 0,
        gpu_layer_budget: match s.gpu_layer_budget {
            hipfire_config::LayerBudget::Auto => None,
            hipfire_config::LayerBudget::Layers(n) => Some(n as usize),
        },
        mode,
        ram_margin_bytes: s.ram_margin_mib << 20,
        flags: hipfire_exec::flags::FlagsTuning {
            tagged_x: s.flags_x_publish == hipfire_config::FlagsXPublish::Tagged,
            ..hipfire_exec::flags::FlagsTuning::default()
        },
        ubatch: s.ubatch as usize,
        host_experts: host_experts(s),
    }
}

/// `memory.n_cpu_moe` (`--cpu-moe`, `--n-cpu-moe N`) as the GPU placement takes it.
pub(crate) fn host_experts(s: &Settings) -> HostExperts {
    match s.n_cpu_moe {
        hipfire_config::CpuMoe::Layers(0) => HostExperts::None,
        hipfire_config::CpuMoe::Layers(n) => HostExperts::FirstLayers(n as usize),
        hipfire_config::CpuMoe::All => HostExperts::All,
    }
}

/// `cpu.threads` as hipfire-exec's pool constructors take it: 0 = their own `auto`.
pub fn pool_threads(t: hipfire_config::Threads) -> usize {
    match t {
        hipfire_config::Threads::Auto => 0,
        hipfire_config::Threads::Count(n) => n.get(),
    }
}

/// Say once when a passback-only key was set but the mode is not passback (it is inert).
fn note_inert(ctx: &Ctx, config: &hipfire_config::Config, s: &Settings) {
    if s.offload_exec == OffloadExec::Passback {
        return;
    }
    for k in [
        "memory.offload_passback_share",
        "memory.join_strategy",
        "memory.flags_x_publish",
    ] {
        if let Ok(r) = config.get(k) {
            if r.source != Source::Default {
                ctx.note(format!(
                    "note: {k} = {} ({}) is inert with offload_exec = {}",
                    r.value, r.source, s.offload_exec
                ));
            }
        }
    }
}

/// Prefill throughput: prompt tokens over prefill seconds (0 when no time was measured).
fn prefill_tok_per_s(st: &GenerationStats) -> f64 {
    if st.prefill_s > 0.0 {
        st.prompt_tokens as f64 / st.prefill_s
    } else {
        0.0
    }
}

/// `hipfire run`.
pub fn run(ctx: &Ctx, a: &RunArgs) -> anyhow::Result<ExitCode> {
    let (config, s) = ctx.settings_with(&a.overrides())?;
    let prompt = match &a.prompt {
        Some(p) => p.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                ctx.note("reading the prompt from stdin (end it with Ctrl-D)");
            }
            let mut t = String::new();
            std::io::stdin()
                .read_to_string(&mut t)
                .context("reading the prompt from stdin")?;
            t
        }
    };
    if prompt.trim().is_empty() {
        bail!("empty prompt (give PROMPT or pipe text on stdin)");
    }
    let engine = choose_engine(ctx, &s)?;
    // Refuse a mode the executor cannot run before spending time on the load.
    let mode = match engine {
        Engine::Gpu => Some(offload_mode(&s)?),
        Engine::Cpu => None,
    };
    let l = load(ctx, engine, &a.model, &s, s.ctx_size.tokens(), !a.json)?;
    // From here a Ctrl-C stops after the current token and still reports.
    let stop = Stop::install()?;
    let tok = l.model.tokenizer();
    let chat = a.chat().unwrap_or(tok.chat.file_has_template());
    // Which template formatted the prompt: "file" (the GGUF's own) or "chatml" (fallback).
    let mut chat_template = None;
    let ids = if chat {
        let msgs = [ChatMessage::new("user", &prompt)];
        let r = tok
            .chat
            .render_or_chatml(&msgs, true)
            .context("rendering the prompt as ChatML")?;
        match (&r.fallback, tok.chat.file_has_template()) {
            (Some(why), _) => ctx.note(format!("warning: {why}; using ChatML instead")),
            (None, false) => ctx.note("note: the model has no chat template; using ChatML"),
            (None, true) => {}
        }
        chat_template = Some(if r.fallback.is_none() && tok.chat.file_has_template() {
            "file"
        } else {
            "chatml"
        });
        tok.encode_rendered_chat(&r.text)?
    } else {
        tok.encode(&prompt, tok.add_bos)?
    };
    let (params, seed) = sampling(&s);
    tracing::info!(seed, chat, prompt_tokens = ids.len(), "sampling");

    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    let mut dec = StreamDecoder::new();
    let mut write_err: Option<anyhow::Error> = None;
    let stream = !a.json;
    // Time to first token: from just before prefill to the first sampled token's callback.
    let mut ttft: Option<std::time::Duration> = None;
    // Set again just before each decoder's generate (after its placement on the GPU).
    let started = std::cell::Cell::new(std::time::Instant::now());
    let mut on_token = |id: u32| -> bool {
        ttft.get_or_insert_with(|| started.get().elapsed());
        match dec.push(tok, id) {
            Ok(piece) => {
                text.push_str(&piece);
                if stream {
                    if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                        write_err = Some(e.into());
                        return false;
                    }
                }
                stop.requested().is_none()
            }
            Err(e) => {
                write_err = Some(e.into());
                false
            }
        }
    };
    let (stats, placement): (GenerationStats, String) = match (&l.engine, mode) {
        (Engine::Cpu, _) | (Engine::Gpu, None) => {
            let mut sess = l.model.session();
            started.set(std::time::Instant::now());
            (
                sess.generate(&ids, &params, &mut on_token)?,
                l.model.placement_summary().to_string(),
            )
        }
        (Engine::Gpu, Some(mode)) => {
            note_inert(ctx, &config, &s);
            let mut d = gpu_decoder(&l, &s, mode)?;
            started.set(std::time::Instant::now());
            let st = d.generate(&ids, &params, &mut on_token)?;
            (st, d.placement_summary().to_string())
        }
    };
    if let Some(e) = write_err {
        return Err(e);
    }
    let tail = dec.finish();
    text.push_str(&tail);
    let interrupted = stop.requested();
    if a.json {
        let v = serde_json::json!({
            "text": text,
            "prompt_tokens": stats.prompt_tokens,
            "generated": stats.generated,
            "prefill_s": stats.prefill_s,
            "decode_s": stats.decode_s,
            "decode_tok_per_s": stats.decode_tok_per_s(),
            "ttft_ms": ttft.map(|d| d.as_secs_f64() * 1e3),
            "prefill_tok_per_s": prefill_tok_per_s(&stats),
            "seed": seed,
            "chat": chat,
            "chat_template": chat_template,
            "engine": match l.engine { Engine::Cpu => "cpu", Engine::Gpu => "gpu" },
            "offload_exec": s.offload_exec.name(),
            "placement": placement,
            "interrupted_by": interrupted.map(stop::signal_name),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(out, "{tail}")?;
        out.flush()?;
        let why = interrupted
            .map(|sig| format!("; stopped by {}", stop::signal_name(sig)))
            .unwrap_or_default();
        ctx.note(format!(
            "[{} prompt tokens, {} generated, {:.1} tok/s decode; {placement}{why}]",
            stats.prompt_tokens,
            stats.generated,
            stats.decode_tok_per_s()
        ));
    }
    Ok(ExitCode::from(
        interrupted.map_or(EXIT_OK, stop::exit_status),
    ))
}

/// `hipfire synth`.
pub fn synth(ctx: &Ctx, a: &SynthArgs) -> anyhow::Result<ExitCode> {
    let fmt = hipfire_quant::Format::from_name(&a.format).with_context(|| {
        let all: Vec<_> = hipfire_quant::Format::ALL
            .iter()
            .map(|f| f.name())
            .collect();
        format!("unknown format `{}`; known: {}", a.format, all.join(", "))
    })?;
    let mut spec = SynthSpec::preset(a.arch.preset())
        .with_context(|| format!("hipfire-model has no preset `{}`", a.arch.preset()))?;
    if let Some(n) = a.layers {
        if n == 0 {
            bail!("--layers must be at least 1");
        }
        spec.n_layer = n as usize;
    }
    if let Some(n) = a.ctx_len {
        spec.ctx_len = usize::try_from(n).context("--ctx-len does not fit this machine")?;
    }
    if let (Some(kind), Some(factor)) = (a.rope_scaling, a.rope_scaling_factor) {
        if !(factor.is_finite() && factor > 0.0) {
            bail!("--rope-scaling-factor must be a positive number, got {factor}");
        }
        let orig_ctx = match a.rope_original_ctx {
            Some(0) => bail!("--rope-original-ctx must be at least 1"),
            Some(n) => n as usize,
            None => spec.ctx_len,
        };
        spec.rope_scaling = RopeScaling {
            kind: match kind {
                SynthRopeScaling::Linear => RopeScalingKind::Linear,
                SynthRopeScaling::Yarn => RopeScalingKind::Yarn,
            },
            factor,
            orig_ctx,
            ..RopeScaling::none(spec.ctx_len)
        };
    }
    // Checked before minutes of writing; the write itself refuses again, atomically.
    if !a.force && std::fs::symlink_metadata(&a.out).is_ok() {
        bail!(
            "{} already exists; pass --force to replace it (by rename: readers of the old \
             file keep their bytes)",
            a.out.display()
        );
    }
    let overwrite = if a.force {
        Overwrite::Replace
    } else {
        Overwrite::Refuse
    };
    let bar = (!ctx.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("writing {bar:40} {bytes}/{total_bytes}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let on_progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let r = write_synthetic_to(&a.out, &spec, fmt, a.seed, Some(&on_progress), overwrite)
        .with_context(|| format!("writing {}", a.out.display()))?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    writeln!(
        std::io::stdout().lock(),
        "wrote {}: SYNTHETIC {} ({} layers, d_model {}, {}), {} params, {} tensors, {} bytes",
        a.out.display(),
        spec.name,
        spec.n_layer,
        spec.d_model,
        fmt,
        r.n_params,
        r.n_tensors,
        r.bytes
    )?;
    Ok(ExitCode::from(EXIT_OK))
}
