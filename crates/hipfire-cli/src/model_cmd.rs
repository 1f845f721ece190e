//! `run`, `bench`, `synth`: thin wrappers over hipfire-model.

use std::process::ExitCode;

use anyhow::bail;

use crate::args::{BenchArgs, RunArgs, SynthArgs};
use crate::Ctx;

/// `hipfire run`.
pub fn run(ctx: &Ctx, a: &RunArgs) -> anyhow::Result<ExitCode> {
    let (_, _settings) = ctx.settings_with(&a.overrides())?;
    let _chat = a.chat();
    bail!("`hipfire run` needs hipfire-model's decode API, which this build does not have")
}

/// `hipfire bench`.
pub fn bench(ctx: &Ctx, a: &BenchArgs) -> anyhow::Result<ExitCode> {
    let (_, _settings) = ctx.settings_with(&a.engine.overrides())?;
    bail!("`hipfire bench` needs hipfire-model's decode API, which this build does not have")
}

/// `hipfire synth`.
pub fn synth(_ctx: &Ctx, a: &SynthArgs) -> anyhow::Result<ExitCode> {
    let _ = a;
    bail!("`hipfire synth` needs hipfire-model's GGUF writer API, which this build does not have")
}
